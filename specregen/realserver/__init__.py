"""The real vLLM server in the loop: a tiny model whose answers a plugin scripts, served by the
real vLLM (CPU build) with the real templates, parsers, detokenizer and streaming.

`server.VllmServer` starts and stops it and scripts its answers; `scripted_model` is the vLLM
plugin (it runs inside the vLLM environment); each family says how it is served
(`registry.real_vllm_spec`). Nothing here is imported by reconstruction.
"""
