"""Platform code: one package per platform (its inbound actor, its executor or
sender, its settings, its fake server for tests). Nothing here leaks into the kernel."""
