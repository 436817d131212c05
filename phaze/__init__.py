"""phaze: joint search of accelerator architecture and device placement for LLM training.

From Python: `phaze.predict(...)` prices one layout on a chip that exists and `phaze.search(...)` runs
the search of `phaze run_solver` (phaze.api). They are loaded on first use, so that `phaze`'s command
starts (and takes a Ctrl-C) before torch is imported.
"""

__all__ = ["predict", "search"]


def __getattr__(name: str):
    if name in __all__:
        from phaze import api

        return getattr(api, name)
    raise AttributeError(f"module 'phaze' has no attribute {name!r}")
