"""Conduit's verl integration: a verl plugin, the ``conduit`` trainer mode and a CPU mode."""
