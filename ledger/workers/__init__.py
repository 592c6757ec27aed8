"""How a long background pass behaves inside a worker: the cluster's stop flag (`stopping`), the
garbage collector (`cycles`) and thread switching (`thread_switching`) during bulk reading and
writing."""
