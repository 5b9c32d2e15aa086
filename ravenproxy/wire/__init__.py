"""ravenproxy.wire"""
