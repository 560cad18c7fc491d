"""The demo: a real, tiny GRPO loop on CPU, instrumented with rlotel under verl's names."""
