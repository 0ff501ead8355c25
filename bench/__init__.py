"""Benchmarks: they import the product (and the test tree's local daemons); the product never imports them."""
