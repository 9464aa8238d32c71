"""Transport implementations; loaded lazily by name through podrun.launch.transport.TRANSPORTS."""
