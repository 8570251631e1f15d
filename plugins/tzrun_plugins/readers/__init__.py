"""First-party tzrec-run plugins: see hooks.py for what this package registers."""
