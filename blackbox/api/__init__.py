"""The HTTP API and the admin page: access control, routes, the views of what is pending,
and the server that runs them."""
