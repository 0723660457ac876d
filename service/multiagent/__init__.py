"""Multi-agent serving: a policy set's act request (many agents, each mapped to its policy)
and its episodes (a record of per-agent sessions), on top of the member policies' act path."""
