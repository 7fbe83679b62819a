"""The explorer's views, one module each; none imports another (each reads the session)."""
