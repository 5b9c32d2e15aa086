"""ravenproxy.transport"""
