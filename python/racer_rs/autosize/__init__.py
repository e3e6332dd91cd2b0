"""``capacity="auto"``: the size rule, the target's forward cost model, the per-edge-cell
acceptance calibration, and the state they keep across requests.
"""
