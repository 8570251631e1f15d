"""First-party eviction policies and admission filters of collision-free ids (``zch`` on an id
feature, docs/zch.md): TorchRec's managed-collision policies, registered by name."""
