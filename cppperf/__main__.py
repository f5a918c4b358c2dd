from cppperf.cli import main

main()
