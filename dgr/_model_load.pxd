# Loading a model's weights, and where each tensor goes (dgr/_model_load.pyx).

from dgr._llama cimport llama_model


cdef object load_model(str path, bint weight_repack, repack, rpc_servers, int rpc_layers,
                       rpc_split, double rpc_timeout_s, llama_model ** out)
