"""A call becomes a row: the message built at call time, checked, batched."""
