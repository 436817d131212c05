"""phaze: joint search of accelerator architecture and device placement for LLM training."""
