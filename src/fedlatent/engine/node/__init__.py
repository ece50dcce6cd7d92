"""The client side: the client node, its (batched) client step and the site's state."""
