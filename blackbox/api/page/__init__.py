"""The admin page: HTML, JavaScript and CSS served as they are (no build step)."""
