"""DataModules for on-disk dataset layouts, samplers and the bundled demo data."""
