// promql-selectors parses PromQL expressions with Prometheus' own parser and prints, for each, the
// series it selects: metric names, label matchers and the labels it groups or matches by. The chart
// tests use it to check the dashboard's and the alerts' queries against a real scrape of the app.
//
//	echo '{"a": "sum by (pod) (rate(x_total{job=\"j\"}[5m]))"}' | promql-selectors
//	{"a": {"selectors": [{"name": "x_total", "matchers": [...]}], "grouping": ["pod"]}}
//
// An expression that does not parse gets {"error": "..."}; the exit code is 1 when any failed.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/promql/parser"
)

type matcher struct {
	Label string `json:"label"`
	Type  string `json:"type"`
	Value string `json:"value"`
}

type selector struct {
	Name     string    `json:"name"`
	Matchers []matcher `json:"matchers"`
}

type result struct {
	Error     string     `json:"error,omitempty"`
	Selectors []selector `json:"selectors"`
	// Labels named in `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left/right (...)`.
	Grouping []string `json:"grouping"`
}

func analyse(expr string) result {
	node, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return result{Error: err.Error()}
	}
	res := result{Selectors: []selector{}, Grouping: []string{}}
	seen := map[string]bool{}
	group := func(labels []string) {
		for _, l := range labels {
			if !seen[l] {
				seen[l] = true
				res.Grouping = append(res.Grouping, l)
			}
		}
	}
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		switch e := n.(type) {
		case *parser.VectorSelector:
			s := selector{Name: e.Name, Matchers: []matcher{}}
			for _, m := range e.LabelMatchers {
				if m.Name == "__name__" {
					continue
				}
				s.Matchers = append(s.Matchers, matcher{Label: m.Name, Type: m.Type.String(), Value: m.Value})
			}
			res.Selectors = append(res.Selectors, s)
		case *parser.AggregateExpr:
			group(e.Grouping)
		case *parser.BinaryExpr:
			if e.VectorMatching != nil {
				group(e.VectorMatching.MatchingLabels)
				group(e.VectorMatching.Include)
			}
		}
		return nil
	})
	sort.Strings(res.Grouping)
	return res
}

func main() {
	var exprs map[string]string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promql-selectors: stdin must be a JSON object {id: expression}:", err)
		os.Exit(2)
	}
	out, failed := map[string]result{}, false
	for id, expr := range exprs {
		out[id] = analyse(expr)
		failed = failed || out[id].Error != ""
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "promql-selectors:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
