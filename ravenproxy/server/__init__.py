"""ravenproxy.server"""
