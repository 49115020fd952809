"""Integrations: hpcckpt wired into simulation frameworks, one module per framework.

Each module imports its framework (only a user of that framework imports it);
``hpcckpt.integrations.veros`` is the Veros ocean model (docs/integrations.md).
"""
