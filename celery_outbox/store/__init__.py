"""The store: the one contract between the core and a database, the records that cross it, and
the schema's extras.
"""
