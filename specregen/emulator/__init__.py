"""A local OpenAI/OpenRouter-compatible server that answers like Kimi K2.5 behind a provider."""
