"""Serving figures: the served rate of whole servers, the front processes' cost, the channel."""
