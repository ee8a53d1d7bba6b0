#!/usr/bin/env python3
"""Convert Kubernetes' api/openapi-spec/swagger.json into standalone, strict JSON schemas for kubeconform.

Usage: k8s_openapi_to_jsonschema.py SWAGGER_JSON OUT_DIR

Writes one file per kind, named the way kubeconform's `{{.ResourceKind}}{{.KindSuffix}}.json` template
expects (service-v1.json, ingress-networking-v1.json, job-batch-v1.json, ...). Like the public
"-standalone-strict" schema sets: every $ref is inlined, objects reject unknown fields, optional fields
accept null (helm renders empty keys as null), int-or-string and resource quantities accept numbers.
Standard library only; runs offline.
"""
import json
import os
import sys

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
SKIP_KINDS = {"WatchEvent", "DeleteOptions", "Status", "APIGroup", "APIGroupList", "APIResourceList", "APIVersions"}


def kind_suffix(group, version):
    """kubeconform: '-' + first label of the group (if any) + '-' + version, lower case."""
    return ("-" + group.split(".")[0] if group else "") + "-" + version


class Converter:
    def __init__(self, definitions):
        self.defs = definitions

    def schema(self, name):
        return self._convert(self.defs[name], (name,))

    def _convert(self, node, stack):
        if isinstance(node, list):
            return [self._convert(n, stack) for n in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):  # (JSONSchemaProps also has a *property* named "$ref")
            name = ref.split("/")[-1]
            if name == QUANTITY:
                return {"oneOf": [{"type": "string"}, {"type": "number"}]}
            if name in stack:  # recursive type (CRD JSONSchemaProps): accept anything below here
                return {}
            return self._convert(self.defs[name], stack + (name,))
        if node.get("format") == "int-or-string":
            return {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        out = {k: self._convert(v, stack) for k, v in node.items()
               if not k.startswith("x-kubernetes-") and k != "description"}
        if "properties" in out:
            required = set(out.get("required", []))
            for prop, sub in out["properties"].items():
                if prop not in required:
                    allow_null(sub)
            out.setdefault("additionalProperties", False)
            out.setdefault("type", "object")
        return out


def allow_null(sub):
    t = sub.get("type")
    if isinstance(t, str):
        sub["type"] = [t, "null"]
    elif "oneOf" in sub and {"type": "null"} not in sub["oneOf"]:
        sub["oneOf"].append({"type": "null"})


def main(swagger_path, out_dir):
    with open(swagger_path) as f:
        definitions = json.load(f)["definitions"]
    conv = Converter(definitions)
    os.makedirs(out_dir, exist_ok=True)
    written = 0
    for name, body in sorted(definitions.items()):
        for gvk in body.get("x-kubernetes-group-version-kind", []):
            kind = gvk["kind"]
            if kind in SKIP_KINDS or kind.endswith("List"):
                continue
            schema = conv.schema(name)
            schema["$schema"] = "http://json-schema.org/schema#"
            path = os.path.join(out_dir, kind.lower() + kind_suffix(gvk["group"], gvk["version"]) + ".json")
            with open(path, "w") as f:
                json.dump(schema, f, separators=(",", ":"))
            written += 1
    if written == 0:
        sys.exit(f"no kinds found in {swagger_path}")
    print(f"wrote {written} schemas to {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
