"""Sections of the pages that are long enough to live apart from their page script."""
