"""Vendor adapters: placeholder until issue 4 lands."""
