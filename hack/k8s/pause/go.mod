module ray-llm-disagg.local/pause

go 1.24.0
