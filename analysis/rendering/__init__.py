"""Figures (Plotly) and exports (JSON, Markdown, PNG) of the views, with one overlay drawer."""
