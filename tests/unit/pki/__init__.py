"""Tests for ravenproxy.pki."""
