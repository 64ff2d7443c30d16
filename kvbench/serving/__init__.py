"""Serving: a trace of requests replayed under a KV budget by an iteration-level scheduler."""
