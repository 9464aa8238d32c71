"""What the controller and the hosts share: the line protocol, the liveness bounds, a machine's facts."""
