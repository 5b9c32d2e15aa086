"""ravenproxy.agent"""
