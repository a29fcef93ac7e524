"""Questions to a stored run: the SQL over the store, the client of a running
agent's API, the `query` command and its flame graph."""
