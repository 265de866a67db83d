from cellscale_hub.app import main

main()
