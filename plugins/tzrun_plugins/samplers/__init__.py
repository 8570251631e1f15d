"""First-party item samplers (sampled negatives for retrieval): see hooks.py for what this package registers."""
