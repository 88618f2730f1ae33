module gpuinfra.local/build/pause

go 1.25.0
