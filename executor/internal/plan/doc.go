// Package plan is the pure, deterministic core of the executor: the
// layout (DESIGN.md section 2) computed from every rank's routing and the
// engine's parameters (ComputeLayout), the capacity rules of capacity
// mode, and the tables the GPU data path reads, built from a layout
// (BuildTables, BuildRailTables) or checked against the GPU layout
// kernels' summary (SummaryLayout). Nothing here moves bytes, allocates
// device memory or talks to a peer; every function is a function of its
// arguments, and the text-driven tests in testdata/layout are its
// specification.
//
//	lay, err := plan.ComputeLayout(rank, plan.Params{NumExperts: 8, TopK: 2, MaxTokensPerRank: 4, PadMultiple: 1}, routing)
//	// lay.RecvCount rows arrive on rank, from lay.RecvSrcRank/RecvSrcToken;
//	// lay.Pos[i*K+k] is row i's position in expert lay.RecvIdx[i*K+k]'s segment.
package plan
