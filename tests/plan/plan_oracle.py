"""A brute-force decomposition search, the oracle the planner's property tests check it against."""


def brute_force(*, devices, devices_per_replica, instances, max_local, min_ga, g, lb, ga):
    """Every (local batch, GA) that meets g exactly, found by trying each local batch: the oracle the
    planner is checked against in both directions (it shares no code with podrun.plan.decompose)."""
    if devices % devices_per_replica:
        return []
    replicas = devices // devices_per_replica
    if replicas % instances or (lb is not None and lb > max_local) or (ga is not None and ga < min_ga):
        return []
    found = []
    for b in range(1, max_local + 1):
        if lb is not None and b != lb:
            continue
        if g % (replicas * b) == 0:
            a = g // (replicas * b)
            if a >= min_ga and (ga is None or a == ga):
                found.append((b, a))
    return found
