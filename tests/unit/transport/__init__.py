"""Tests for ravenproxy.transport."""
