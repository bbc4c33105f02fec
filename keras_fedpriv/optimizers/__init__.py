"""Planned: see the open issues (this subpackage is filled by a later issue)."""
