"""`touchstone bench serve`: client-side serving benchmark of an OpenAI-compatible server (bench.serve.cli)."""
