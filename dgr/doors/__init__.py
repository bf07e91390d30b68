"""The protocol doors: each parses a request body into its sessions (the prompt
ids and SamplingParams that dgr.Node takes whole) and renders their results in
its protocol's shape, over one server-sent-events writer with one ending for a
failed or cancelled session (dgr.doors.sse).

- `completions`: OpenAI's /v1/completions and /v1/chat/completions (parsing and
  response objects in `openai`)
- `responses`: OpenAI's /v1/responses
- `anthropic`: Anthropic's /v1/messages and /v1/messages/count_tokens
- `llama_native`: llama.cpp's /completion, /props and /apply-template
- `tokens`: llama-server's /tokenize and /detokenize, vLLM's /tokenize shape and
  render endpoints
- `routers`: the load that routers poll (SGLang's and vLLM's shapes) and the
  Inference Extension's gauges

`fields` holds every door's accepted fields in one table; `context` is what a
door sees of the server. dgr/server.py wires the routes.
"""
