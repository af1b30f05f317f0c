"""Test configuration: the control-plane fixtures come from vkprovider's own pytest plugin."""

pytest_plugins = ["vkprovider.testing.plugin"]
