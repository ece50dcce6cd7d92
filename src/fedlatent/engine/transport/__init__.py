"""Transport: the in-process runtime (Flower adapters live in fedlatent.runtime)."""
