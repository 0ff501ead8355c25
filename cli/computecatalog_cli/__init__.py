"""cc: the Compute Catalog's command line, a client of its REST API (/api/v1/)."""
