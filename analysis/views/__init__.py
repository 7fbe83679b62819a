"""The explorer's views, one module each, each reading the session; table and compare build on neighbors."""
