from glmfb.cli import main

main()
