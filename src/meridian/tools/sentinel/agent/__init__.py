"""The running agent: Runtime composes a Consumer, a Flusher, a Plan and the
control the API calls over one small state; Services starts what runs around it
(/metrics, the API, the anomaly monitor); run.py builds it all from the config."""
