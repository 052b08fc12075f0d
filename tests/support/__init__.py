"""Support code shared by several test packages."""
