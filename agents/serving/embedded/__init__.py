"""The embedded engine: parley's OpenAI-compatible server over transformers, a drop-in for vLLM's.

`server` is its web app and command line (`python -m agents.serving.embedded.server`); `engine`
decodes the requests in flight together, with `decoding`, `batchcache`, `constraints`,
`weights` and `cpu` under it. What it shares with vLLM's launcher lives one level up
(agents.serving.protocol, agents.serving.adapters, agents.serving.kvcache); starting it as a
child process is agents.serving.launch's job.
"""
