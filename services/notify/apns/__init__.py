"""APNs delivery: the provider token, the HTTP/2 client, the sender that drains
notify.pushes, and the checks behind `atelier push doctor`."""
