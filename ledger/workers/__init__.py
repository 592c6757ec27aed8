"""How a long background pass behaves inside a worker: the cluster's stop flag, the garbage collector and thread switching during bulk reading and writing."""
