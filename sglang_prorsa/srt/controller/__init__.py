"""The controller (the paper's global manager): the registry of instances, the forecast -> allocation -> switch
loop, and the orchestration of each switch across the instances and any external router's pools."""
