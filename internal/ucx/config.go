package ucx

import (
	"fmt"
	"strings"
)

// Feature is a ucp_feature bit (ucp_params_t.features).
type Feature uint64

// The features goep uses; the values are UCX's.
const (
	FeatureTag    Feature = 1 << 0 // UCP_FEATURE_TAG
	FeatureRMA    Feature = 1 << 1 // UCP_FEATURE_RMA: put and get
	FeatureAMO64  Feature = 1 << 3 // UCP_FEATURE_AMO64: 64-bit atomics
	FeatureWakeup Feature = 1 << 4 // UCP_FEATURE_WAKEUP
)

// ThreadMode is a worker's ucs_thread_mode_t.
type ThreadMode int

// Thread modes; the values are UCX's.
const (
	// ThreadSingle: one OS thread (the one that created the worker) makes
	// every call. Only for a worker used from a goroutine locked to its OS
	// thread (runtime.LockOSThread).
	ThreadSingle ThreadMode = 0
	// ThreadSerialized: any thread, one at a time. The default: the
	// binding's per-worker mutex serialises the calls.
	ThreadSerialized ThreadMode = 1
)

// ContextConfig configures NewContext.
type ContextConfig struct {
	// Features to request; 0 means FeatureRMA | FeatureAMO64.
	Features Feature
	// Options are UCX configuration overrides applied with
	// ucp_config_modify on top of the UCX_* environment, each "NAME=VALUE"
	// with NAME without the UCX_ prefix (for example "TLS=tcp,sm",
	// "KEEPALIVE_INTERVAL=1s").
	Options []string
	// EstimatedEndpoints is a hint for UCX's resource sizing (0: none).
	EstimatedEndpoints int
}

// ErrorMode is an endpoint's ucp_err_handling_mode_t.
type ErrorMode int

// Error handling modes; the values are UCX's.
const (
	// ErrorModePeer: a failed peer or link is reported through the
	// endpoint's error handler (Endpoint.Err) and fails its operations
	// instead of hanging. UCX then uses only transports that can detect a
	// failed peer: TCP, InfiniBand/RoCE, not shared memory (UCX 1.13).
	ErrorModePeer ErrorMode = 1
	// ErrorModeNone: no failure detection; every transport may be used
	// (shared memory among them). A dead peer is noticed only by the
	// caller's own means (process checks, deadlines).
	ErrorModeNone ErrorMode = 0
)

// MemoryTypes is a set of ucs_memory_type_t bits: the memory a context's
// transports can read and write (ucp_context_attr_t.memory_types).
type MemoryTypes uint64

// The memory types; the bit numbers are UCX's (ucs_memory_type_t).
const (
	MemoryHost        MemoryTypes = 1 << 0 // UCS_MEMORY_TYPE_HOST
	MemoryCUDA        MemoryTypes = 1 << 1 // UCS_MEMORY_TYPE_CUDA
	MemoryCUDAManaged MemoryTypes = 1 << 2 // UCS_MEMORY_TYPE_CUDA_MANAGED
	MemoryROCm        MemoryTypes = 1 << 3 // UCS_MEMORY_TYPE_ROCM
	MemoryROCmManaged MemoryTypes = 1 << 4 // UCS_MEMORY_TYPE_ROCM_MANAGED
)

var memoryTypeNames = []struct {
	t    MemoryTypes
	name string
}{{MemoryHost, "host"}, {MemoryCUDA, "cuda"}, {MemoryCUDAManaged, "cuda-managed"}, {MemoryROCm, "rocm"}, {MemoryROCmManaged, "rocm-managed"}}

// CUDA reports whether the transports can access CUDA device memory (a UCX
// built with CUDA support, whose cuda_copy or cuda_ipc transport, with
// GPUDirect RDMA on the network, moves it).
func (m MemoryTypes) CUDA() bool { return m&MemoryCUDA != 0 }

// String names the types, comma separated ("host, cuda"); unknown bits
// as a hexadecimal remainder; "none" for the empty set.
func (m MemoryTypes) String() string {
	var names []string
	for _, n := range memoryTypeNames {
		if m&n.t != 0 {
			names = append(names, n.name)
			m &^= n.t
		}
	}
	if m != 0 {
		names = append(names, fmt.Sprintf("%#x", uint64(m)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
