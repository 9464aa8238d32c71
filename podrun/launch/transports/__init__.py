"""Transport implementations; loaded lazily by name through podrun.launch.transports.base.TRANSPORTS."""
